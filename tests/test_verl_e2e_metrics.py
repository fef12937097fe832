"""scripts/verl_e2e_metrics.py: the engine comparison's check that verl and local trained on the same prompts."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
from minite_test_support import load_script


def _runs(tmp_path, verl_questions, local_steps):
    verl, local = tmp_path / "verl", tmp_path / "local"
    (verl / "data").mkdir(parents=True)
    local.mkdir()
    rows = [{"extra_info": {"question": q}} for q in verl_questions]
    pq.write_table(pa.Table.from_pylist(rows), str(verl / "data" / "train.parquet"))
    (local / "samples.jsonl").write_text("".join(json.dumps({"step": s, "question": q}) + "\n"
                                                 for s, qs in local_steps.items() for q in qs))
    (local / "config.yaml").write_text("rollout:\n  prompts_per_step: 2\n")
    for run, row in ((verl, {"step": 1, "data": {"critic/score/mean": 0.5}}), (local, {"step": 1, "reward/mean": 0.5})):
        (run / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    return verl, local


def test_same_prompts_per_step(tmp_path, capsys):
    m = load_script("verl_e2e_metrics")
    verl, local = _runs(tmp_path, ["a", "b", "c", "a"], {1: ["b"], 2: ["c", "a"], 3: ["d"]})
    # step 1 rows a, b: holds b; step 2 rows c, a: holds both; step 3: verl has no rows
    assert m.same_prompts(verl, local, 2) == {"steps": 3, "same": 2, "differ_at": [3]}
    assert m.same_prompts(verl, local, 1) == {"steps": 3, "same": 0, "differ_at": [1, 2, 3]}  # a misaligned read
    assert m.main([f"verl={verl}", f"local={local}"]) == 0
    assert json.loads(capsys.readouterr().out)["prompts"] == {"steps": 3, "same": 2, "differ_at": [3]}
