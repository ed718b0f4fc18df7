from vllm_layerskip.methods.clasp.options import ClaspOptions
from vllm_layerskip.methods.registry import MethodSpec

METHOD = MethodSpec(
    name="clasp",
    options=ClaspOptions,
    proposer="vllm_layerskip.methods.clasp.proposer.ClaspProposer",
)
