"""The llama-server engine: ``server`` (launch, status, stop; either engine's server
process), ``serve`` (``gguf-exact serve`` as two calls), ``drafter_lookup`` (the drafter
for a target), ``client`` (requests), ``speculation`` (is drafting paying?), ``stats``
(/metrics and log lines), ``logged_buffers`` (llama-server's buffers beside the plan)."""
