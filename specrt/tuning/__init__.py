"""Cost and k choice: what forwards cost on this machine, and how many tokens to draft.

Owns: measured step-cost profiles and their storage in the bundle's profile folder (`profile.py`, timed by
`measure.py`), the live step costs of the target and draft (`stepcost.py`), acceptance estimates and the
draft's confidence calibration (`acceptance.py`), the per-request choice of k (`costmodel.py`: `choose` is a
pure query, `observe` the one place that learns), and the batch's ceiling on k (`batchcost.py`).

Imports specrt.bundle, specrt.runtime (only to time a session's runs) and specrt.errors. Knows nothing
about requests or the scheduler: the engine hands it numbers and asks it questions.
"""
