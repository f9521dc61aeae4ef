"""The reporting layer: pure renderers of what runs measured. Round protocols
(:mod:`~fedshift.reporting.protocols`), tables (:mod:`~fedshift.reporting.tables`), plots
(:mod:`~fedshift.reporting.plots`), drift measures (:mod:`~fedshift.reporting.drift_measures`,
:mod:`~fedshift.reporting.drift_report`) and the catalogue of names
(:mod:`~fedshift.reporting.catalogue`). Nothing here runs training or reads a run folder."""
