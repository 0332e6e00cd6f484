"""``diffrl bench``: a model scored on a benchmark's own prompts as the benchmark scores it.

- :mod:`~diffrl.bench.suites`: the suites' table (``SUITES``) and their prompt files in their
  formats (GenEval's ``evaluation_metadata.jsonl``, flow_grpo's ``ocr/test.txt``, DrawBench's
  csv); no torch.
- :mod:`~diffrl.bench.geneval`: GenEval's correctness rules on detections.
- :mod:`~diffrl.bench.detect`: the detector (OWL-ViT / OWLv2) and the CLIP colour classifier.
- :mod:`~diffrl.bench.score`: sampling with fixed seeds and scoring each suite.
- :mod:`~diffrl.bench.scorers`: each suite's scorer, by name (the torch side of ``suites.SUITES``).
- :mod:`~diffrl.bench.table`: per-category tables paired against a baseline; ``bench.json``.
- :mod:`~diffrl.bench.report`: the Benchmarks section of a run's report page.
- :mod:`~diffrl.bench.verdict`: the PASS / MISS / inconclusive rule of the speed scripts under
  ``benchmarks/`` (no verdict when the rounds' spread exceeds the effect claimed); no torch.
"""
