"""What runs in DraftGate's gateway for a ``vllm+http://`` target: the route whose vLLM runs the
proposer (`plugin_route`), the gateway's own rounds against a vLLM that only scores (`target`, its
price per draft `pricing`, its HTTP calls `wire`, wired by `engine`), and the start-up checks that
pick the mode and measure the near-tie margin (`checks`). No vLLM import: vLLM is reached over HTTP."""
