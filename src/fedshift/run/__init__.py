"""The run layer: one run from a validated config to its folder.

- :mod:`~fedshift.run.experiment`: builds the scenario, model, algorithm and executor of a
  config and runs the simulator (:func:`~fedshift.run.experiment.run_experiment`);
- :mod:`~fedshift.run.folder`: the run folder (config, metrics, summary, checkpoints);
- :mod:`~fedshift.run.lock`: one writer a folder; :mod:`~fedshift.run.supervise`: the watched
  child process that trains (a run the system kills is reported with its folder).
"""
