"""Tooling around a vLLM deployment, used by the benchmarks, the live tests and the demo: start a
vLLM server on loopback (`launch`), export the bundled model as a Hugging Face folder
(`hf_folder`), compare arms one vLLM at a time (`compare`, `compare_servers`), read a running
vLLM's counters and round cost (`probes`), check a release's proposer interface (`interface_check`)."""
