"""Tools around runs: the throughput benchmark (:mod:`~fedshift.tools.bench`), linear probes and
fresh critics on learned features (:mod:`~fedshift.tools.probes`) and the provenance of every
published number (:mod:`~fedshift.tools.provenance`)."""
