"""Glue between the D3S core (`d3s`) and training frameworks.

Each integration lives in its own module and imports its framework only when that module is
imported, so `import d3s` needs torch alone:

- `d3s.integrations.trl`: `D3SConfig` and `D3SGRPOTrainer`, drop-ins for TRL's `GRPOConfig` and
  `GRPOTrainer` (needs `pip install "d3s[trl]"`).
"""
