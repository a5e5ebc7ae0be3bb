"""Whether the arms of a seed are paired in fact: the same prompt stream, read from the runs' records, and the
correlation of their outcomes over seeds; and `d3s compare`'s table of both."""

import json

import pytest
from test_compare_summary import _write_run

from d3s.app.compare.markdown import render_markdown
from d3s.app.compare.pairing import correlation, prompt_stream, same_prompts
from d3s.app.compare.summary import summarize


def _train(*lists):
    return [{"type": "eval", "step": 0}] + [{"type": "train", "step": i, "prompt_hashes": h}
                                            for i, h in enumerate(lists, 1)]


def test_a_stream_is_the_steps_prompts_in_order_a_repeated_generation_batch_once():
    assert prompt_stream(_train(["a", "b"], ["c", "d"])) == ["a", "b", "c", "d"]
    # one generation batch serving two steps is listed by both records: counted once
    assert prompt_stream(_train(["a", "b"], ["a", "b"], ["c", "d"])) == ["a", "b", "c", "d"]
    assert prompt_stream(_train(["a"], ["b"], ["a"])) == ["a", "b", "a"]
    assert prompt_stream([{"type": "train", "step": 1}]) is None  # a run made before records listed their prompts


def test_two_streams_agree_over_the_length_both_reached():
    short, long = ["a", "b", "c", "d"], ["a", "b", "c", "d", "e", "f"]
    assert same_prompts(short, long) is True and same_prompts(long, short) is True
    assert same_prompts(short, ["a", "b", "x", "d", "e"]) is False
    assert same_prompts(["b", "a", "c", "d"], short) is False  # the same prompts in another order are not paired
    assert same_prompts(None, short) is None and same_prompts([], short) is None


def test_correlation_is_pearsons_r_and_none_where_undefined():
    xs, ys = [0.5, 0.6, 0.7, 0.9], [0.4, 0.5, 0.7, 0.6]
    mx, my = sum(xs) / 4, sum(ys) / 4
    num = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    den = (sum((x - mx) ** 2 for x in xs) * sum((y - my) ** 2 for y in ys)) ** 0.5
    assert correlation(xs, ys) == pytest.approx(num / den)
    assert correlation([0.1, 0.2, 0.3], [0.3, 0.2, 0.1]) == pytest.approx(-1.0)
    assert correlation([0.5, 0.6], [0.5, 0.6]) is None  # two seeds: r is always +-1
    assert correlation([0.5, 0.5, 0.5], [0.1, 0.2, 0.3]) is None


def test_compare_says_which_seeds_trained_on_the_reference_prompts(tmp_path):
    finals = {"grpo": [0.5, 0.6, 0.7], "d1s-c": [0.55, 0.7, 0.75]}
    for v, accs in finals.items():
        for seed, acc in zip((1, 2, 3), accs):
            run = tmp_path / f"{v}-seed{seed}"
            _write_run(run, acc, [0.4, acc, acc])
            records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            for r in records:
                if r["type"] == "train":  # seed 3's d1s-c run drew other prompts from its third step on
                    other = v == "d1s-c" and seed == 3 and r["step"] >= 3
                    r["prompt_hashes"] = [f"s{seed}-{'x' if other else ''}{r['step']}-{i}" for i in range(2)]
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = summarize(tmp_path, ["grpo", "d1s-c"], [1, 2, 3])
    d1s_c = summary["variants"]["d1s-c"]
    assert [p["same_prompts_as_reference"] for p in d1s_c["per_seed"]] == [True, True, False]
    assert (d1s_c["prompts_checked_seeds"], d1s_c["same_prompts_seeds"]) == (3, 2)
    assert d1s_c["correlation_with_reference"] == pytest.approx(correlation(finals["d1s-c"], finals["grpo"]))
    md = render_markdown(summary, "d3s compare")
    assert "## Pairing with grpo" in md
    assert f"| d1s-c | 2 of 3 seeds (!) | {d1s_c['correlation_with_reference']:.2f} | - |" in md
