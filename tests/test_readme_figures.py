"""`scripts/readme_figures.py`: the figures README.md and docs/*.md quote are the ones the committed campaigns
give, and a figure edited by hand is caught."""

import importlib.util
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("readme_figures", ROOT / "scripts" / "readme_figures.py")
figures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(figures)


def test_the_pages_quote_what_the_committed_data_gives():
    assert figures.run(ROOT, check=True) == []
    assert figures.main(["--check"]) == 0


def test_every_block_is_used_by_a_page():
    used = {m.group("name") for page in figures.pages(ROOT) for m in figures.BLOCK.finditer(page.read_text())}
    assert used == set(figures.FIGURES)


def test_a_figure_edited_by_hand_is_named(tmp_path):
    copy = tmp_path / "README.md"
    shutil.copy(ROOT / "README.md", copy)
    text = copy.read_text()
    block = re.search(r"<!-- figures:quick-evidence -->\n(.*?)<!-- /figures:quick-evidence -->", text, re.S)
    edited = block.group(1).replace("65.8%", "68.5%", 1)
    assert edited != block.group(1)
    copy.write_text(text.replace(block.group(1), edited))
    assert figures.run(ROOT, check=True, files=[copy]) == ["README.md: quick-evidence"]
    assert "68.5%" in copy.read_text()  # --check leaves the page as it is
    assert figures.run(ROOT, check=False, files=[copy]) == ["README.md: quick-evidence"]
    assert copy.read_text() == text


def test_an_interval_containing_zero_shows_nothing():
    assert figures.paired(0.022, (-0.105, 0.149)) == "+2.2 points [-10.5, +14.9], not shown"
    assert figures.paired(0.09, (0.016, 0.164)) == "+9.0 points [+1.6, +16.4]"
