"""Generative models on the device: continuous batching behind a transport-free core.

- :mod:`agent.generative.scheduler`: the pure, clock-injected scheduler (slots, KV budget in
  tokens, wait queue, chunked prefill, cancellation);
- :mod:`agent.generative.decoder`: the model call on a placed runtime, with the KV cache;
- :mod:`agent.generative.sampling`: greedy and sampled token choice, penalties, stop strings;
- :mod:`agent.generative.text`: tokenizer and chat template;
- :mod:`agent.generative.engine`: the token loop of one version and its streams;
- :mod:`agent.generative.models`: the generative models of the repository, hot-swapped;
- :mod:`agent.generative.metrics`: TTFT, inter-token and end-to-end latency, tokens, state.

Nothing here knows HTTP: the OpenAI-compatible front end (:mod:`agent.openai`) is an adapter.
Imported only when the repository holds a generative model.
"""
