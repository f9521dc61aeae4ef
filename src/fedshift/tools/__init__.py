"""Tools around runs: the throughput benchmark (:mod:`~fedshift.tools.bench`), linear probes and
fresh critics on learned features (:mod:`~fedshift.tools.probes`), the provenance of every
published number (:mod:`~fedshift.tools.provenance`, with :mod:`~fedshift.tools.positions`: a
number's table cell or place in the prose) and the archive of a results folder's run
files (:mod:`~fedshift.tools.artifacts`)."""
