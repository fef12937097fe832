"""Rewards for RL training: verifiable answer scoring (math, GSM8K) shared with ``python -m eval``."""
