"""Rewards for RL training: the task's verifiable reward (``registry``), scored by ``scoring`` as ``python -m eval``
scores the same answers."""
