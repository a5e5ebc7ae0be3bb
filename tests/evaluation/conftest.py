from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny_model import build_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture()
def tiny_gsm8k(tmp_path) -> Path:
    """Three problems in GSM8K's format with golds 7, 3 and 5 (the tiny model says 7 or 3)."""
    path = tmp_path / "gsm8k.jsonl"
    rows = [
        {"question": "Tom has 3 apples and gets 4 more. How many?", "answer": "3+4=7\n#### 7"},
        {"question": "What is 1 + 2?", "answer": "1+2=3\n#### 3"},
        {"question": "What is 2 + 3?", "answer": "2+3=5\n#### 5"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
