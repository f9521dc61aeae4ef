"""Studies: many runs planned, executed and summarised together, above the single run of
:mod:`fedshift.run.experiment`.

- :mod:`~fedshift.studies.jobs` — run independent, resumable runs in this process, in worker
  processes or as Ray tasks (:func:`~fedshift.studies.jobs.execute`);
- :mod:`~fedshift.studies.compare` — several algorithms on one scenario and seed;
- :mod:`~fedshift.studies.reproduce` — a paper table: rows x learning rates x seeds beside the
  paper's numbers;
- :mod:`~fedshift.studies.sweep` — any grid of config overrides x seeds, mean ± std per setting.
"""
