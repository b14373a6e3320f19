"""PromQL over the store: parsed by ``promql-parser``, evaluated with Prometheus 2.42's
semantics (``engine``), read through a ``SampleSource`` (``source``)."""
