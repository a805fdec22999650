"""A client of OpenAI-compatible inference servers (vLLM, SGLang, TGI, llama.cpp, Ollama, hosted
APIs), shared by generate and the served judge: :mod:`.settings` (server settings, API key,
neutral sampling), :mod:`.protocol` (request bodies, answers, error bodies), :mod:`.client` (one
server: retries, refusals), :mod:`.pool` (the servers of a stage, checked by their first real
request), :mod:`.grammar` (llama.cpp grammar check), :mod:`.aio` (one event loop for them all)."""
