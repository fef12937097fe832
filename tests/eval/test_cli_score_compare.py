"""`python -m eval score` / `compare` / `tasks` through the CLI entry point."""
from __future__ import annotations

import json
import re

import pytest

from eval.cli import main
from eval.data import load_rows
from eval.report import atomic_write_json
from eval.task import get_task


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def _score(capsys, *args):
    rc = main(["score", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_score_math_index_and_prompt_rows(tmp_path, capsys):
    exs = get_task("aime24").examples(load_rows(get_task("aime24")))
    preds = _write(tmp_path / "p.jsonl", [
        {"index": 0, "responses": [f"\\boxed{{{exs[0].gold}}}", "\\boxed{1}"]},  # 1 of 2
        {"prompt": exs[1].question, "response": f"so \\boxed{{{exs[1].gold}}}"},  # bare question text
        {"prompt": exs[1].question, "response": "\\boxed{1}"},  # its second sample, on a row of its own
        {"prompt": exs[2].prompt, "responses": ["I cannot solve this.", "no"]},  # templated prompt; nothing
    ])
    rc, out, _ = _score(capsys, "aime24", preds, "--json")
    assert rc == 0 and len(out.strip().splitlines()) == 1
    res = json.loads(out)
    # 6 responses, 2 correct; the unanswerable ones are counted, not dropped
    assert res["accuracy"] == pytest.approx(2 / 6) and res["n"] == 6 and res["n_prompts"] == 3


def test_score_refuses_duplicated_rows_and_unequal_k(tmp_path, capsys):
    exs = get_task("aime24").examples(load_rows(get_task("aime24")))
    right = {"index": 0, "sample": 0, "response": f"\\boxed{{{exs[0].gold}}}"}
    rc, _, err = _score(capsys, "aime24", _write(tmp_path / "d.jsonl", [right, right]))
    assert rc == 2 and "d.jsonl:2: prompt 0 sample 0 is already on line 1" in err
    five = [{**right, "sample": s} for s in range(5)] + [{"index": 1, "response": "\\boxed{1}"}]
    rc, _, err = _score(capsys, "aime24", _write(tmp_path / "u.jsonl", five))
    assert rc == 2 and "unequal numbers of responses (prompt 1: 1, prompt 0: 5)" in err


def test_score_ifeval_metrics(tmp_path, capsys):
    preds = _write(tmp_path / "p.jsonl", [{"index": 1, "response": "Verily, a journey"},  # no_comma fails
                                          {"index": 1, "response": "Verily a journey to Kyoto"}])
    rc, out, _ = _score(capsys, "ifeval", preds, "--json")
    res = json.loads(out)
    assert rc == 0
    assert set(res) >= {"prompt_level_strict", "prompt_level_loose", "instruction_level_strict",
                        "instruction_level_loose", "n"}
    assert res["prompt_level_strict"] == pytest.approx(0.5) and res["n"] == 2


@pytest.mark.parametrize("bad_row, message", [
    ('{"index": 0, "response": ', "p.jsonl:2: not valid JSON"),
    ('{"response": "x"}', "p.jsonl:2: row needs 'index'"),
    ('{"index": 30, "response": "x"}', r"p.jsonl:2: 'index' must be an integer in \[0, 30\)"),
    ('{"index": 0}', "p.jsonl:2: row needs 'response'"),
    ('{"index": 0, "responses": []}', "p.jsonl:2: 'responses' must be a non-empty list"),
    ('{"prompt": "not a real question", "response": "x"}', "p.jsonl:2: 'prompt' does not match"),
    ('[1, 2]', "p.jsonl:2: expected a JSON object"),
])
def test_malformed_predictions_report_the_line(tmp_path, capsys, bad_row, message):
    preds = _write(tmp_path / "p.jsonl", ['{"index": 0, "response": "\\\\boxed{204}"}', bad_row])
    rc, out, err = _score(capsys, "aime24", preds)
    assert rc == 2 and out == ""
    assert re.search(message, err), err


def test_score_unknown_task_and_missing_file(tmp_path, capsys):
    rc, _, err = _score(capsys, "gsm8", str(tmp_path / "x.jsonl"))
    assert rc == 2 and "did you mean 'gsm8k'" in err and "valid tasks: " in err
    rc, _, err = _score(capsys, "gsm8k", str(tmp_path / "missing.jsonl"))
    assert rc == 2 and "missing.jsonl" in err


def test_compare_prints_table_with_pp_differences(tmp_path, capsys):
    for name, means in (("bf16", (0.30, 0.80)), ("nvfp4", (0.27, 0.81))):
        atomic_write_json(tmp_path / name / "results.json", {"tasks": {
            "aime24": {"title": "AIME24", "mean": means[0]}, "ifeval": {"title": "IFEval", "mean": means[1]}}})
    assert main(["compare", str(tmp_path / "bf16"), str(tmp_path / "nvfp4")]) == 0
    out = capsys.readouterr().out
    assert "| run | AIME24 | IFEval | Average |" in out
    assert "| bf16 | 30.00 | 80.00 | 55.00 |" in out
    assert "| Δ pp (nvfp4 - bf16) | -3.00 | +1.00 | -1.00 |" in out
    assert main(["compare", str(tmp_path / "bf16"), str(tmp_path / "nope")]) == 2


def test_tasks_command(capsys):
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    assert "aime24" in out and "k=6" in out and "prompt_level_strict" in out


def test_score_on_a_directory_or_deep_json_is_one_line(tmp_path, capsys):
    rc, _, err = _score(capsys, "aime24", str(tmp_path))
    assert rc == 2 and "is a directory, not a jsonl file" in err and "Traceback" not in err
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    rc, _, err = _score(capsys, "aime24", str(deep))
    assert rc == 2 and "deep.jsonl:1:" in err and "Traceback" not in err


def test_compare_on_a_results_file_missing_keys_is_one_line(tmp_path, capsys):
    bad = tmp_path / "r.json"
    bad.write_text(json.dumps({"tasks": {"gsm8k": {"k": 4}}}))
    rc = main(["compare", str(bad), str(bad)])
    err = capsys.readouterr().err
    assert rc == 2 and "task 'gsm8k' lacks ['mean', 'title']" in err and "Traceback" not in err


@pytest.mark.parametrize("args, protocol, ks, budget", [
    (["--device", "cpu"], "quick", {"gsm8k": 1, "ifeval": 1}, 256),
    (["--device", "cpu", "--protocol", "report"], "report", {}, 8192),
    (["--device", "cuda"], "report", {}, 8192),
    (["--device", "cpu", "--samples", "gsm8k=3", "--max-new-tokens", "64"], "quick", {"gsm8k": 3, "ifeval": 1}, 64),
])
def test_protocol_sets_k_and_the_token_budget(monkeypatch, capsys, args, protocol, ks, budget):
    from eval import runner

    seen = {}

    def fake_run(cfg, show_progress=True):
        seen["cfg"] = cfg
        return {"tasks": {}, "average": {"mean": 0.0}, "output_dir": "x"}

    monkeypatch.setattr(runner, "run_eval", fake_run)
    assert main(["run", "some-model", "--tasks", "gsm8k,ifeval", *args]) == 0
    cfg = seen["cfg"]
    assert (cfg.protocol, cfg.samples, cfg.params.max_new_tokens) == (protocol, ks, budget)


def test_the_plan_names_responses_budget_and_protocol():
    from eval.engines import GenerationParams
    from eval.runner import RunConfig, plan_text

    cfg = RunConfig(model="m", tasks=("gsm8k",), protocol="quick", params=GenerationParams(max_new_tokens=256))
    text = plan_text(cfg, [get_task("gsm8k")], {"gsm8k": 2}, {"gsm8k": [None] * 5})
    assert "gsm8k 5 x k=2 = 10 responses of up to 256 new tokens (at most 2,560 tokens), protocol quick" in text
    assert "--protocol report" in text
