"""Everything that does not need Triton works on a machine without it.

A subprocess whose ``import triton`` fails (a shadowing package that raises ImportError) imports the project,
builds a quantized model on the CPU, steps ``minite_kernels.optim.AdamW`` (its PyTorch reference path), and
``ModelWeightSync`` syncs nothing and says why: the layer's backend has no grouped re-quantizer. CI may or may
not have Triton installed; this test does not depend on it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import torch
    try:
        import triton  # noqa: F401
        raise SystemExit("triton imported: the shadowing package did not take effect")
    except ImportError:
        pass
    import minite_kernels
    from minite_kernels.modules import Linear
    from minite_kernels.optim import AdamW

    layer = Linear(32, 16, qlinear_params="nvfp4_per_token_bf16_bwd", dtype=torch.bfloat16)
    opt = AdamW(layer.parameters(), lr=1e-2)
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    layer(x).float().square().sum().backward()
    opt.step()
    assert opt.reference_params == 2 and opt.kernel_launches == 0
    assert opt.amax(layer.weight).item() == layer.weight.float().abs().max().item()
    from minite_kernels.modules.weight_sync import ModelWeightSync
    sync = ModelWeightSync(layer, opt)
    assert sync.num_weights == 0 and sync.unsynced == [""], (sync.num_weights, sync.unsynced)
    ((name, why),) = sync.skipped
    assert "emulated backend has no grouped weight re-quantizer" in why, why
    assert sync.sync()["perf/grouped_sync_weights"] == 0.0
    print("ok", minite_kernels.__name__)
    """
)


def test_project_works_where_triton_does_not_import(tmp_path):
    shadow = tmp_path / "triton"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('triton is blocked for this test')\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), root]))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok minite_kernels")
