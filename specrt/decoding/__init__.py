"""Owns the speculative maths of one row: warping and sampling (`sampling.py`), picking a token and accepting
drafts against the target's logits (`speculative.py`), prompt-lookup proposals (`drafters.py`), and the
greedy-divergence helpers that tell a near-tie from a real difference (`divergence.py`).

Pure functions of arrays and a random generator. Imports only specrt.options and numpy: no sessions, no
batches, no costs.
"""
