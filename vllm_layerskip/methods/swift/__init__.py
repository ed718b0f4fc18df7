from vllm_layerskip.methods.swift.options import SwiftOptions
from vllm_layerskip.methods.registry import MethodSpec

METHOD = MethodSpec(
    name="swift",
    options=SwiftOptions,
    proposer="vllm_layerskip.methods.swift.proposer.SwiftProposer",
)
