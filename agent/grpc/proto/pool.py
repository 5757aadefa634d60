"""The descriptor pool of the KServe V2 / Triton protos, kept apart from protobuf's default
pool so that the agent's messages and a tritonclient imported in the same process (tests,
benchmarks) never clash over the ``inference.*`` names."""

from google.protobuf.descriptor_pool import DescriptorPool

POOL = DescriptorPool()
