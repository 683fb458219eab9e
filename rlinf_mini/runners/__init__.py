"""The runners: base.py (the step loop both halves share), embodied.py and reasoning.py (what each half's step does)."""
