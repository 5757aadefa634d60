"""KServe V2 / Triton ``inference.GRPCInferenceService``: the protos as published by
triton-inference-server/common (BSD-3-Clause, headers kept) and the code generated from them
(:mod:`agent.grpc.proto.regenerate`)."""
