"""A controlled study of TRIAGE where the true gradient is known (issue 40, deliverable 1).

A small policy (``policy``: S independent MLPs at once) learns a synthetic task with long responses (``task``:
stride chains of 256-1,024 tokens, a verifiable reward, an exact expected reward). Its sampler is mismatched in
one known way at a time (``mismatch``: i.i.d. logit noise, temperature, negative-gap bursts in 64-token windows,
NVFP4 through the project's emulated backend). Four estimators (``gradient``: on-policy, no correction, TIS,
TRIAGE through ``triage.triage_policy_loss``) are compared with the on-policy gradient's expectation at fixed
parameters, over hundreds of seeds, and in learning curves (``learning``); ``stats`` holds the statistics,
``report`` the tables and figures, ``study`` the resumable runner.

    python -m trainers.controlled recipes/studies/controlled.yaml
"""
