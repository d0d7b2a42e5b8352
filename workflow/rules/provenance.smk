# Provenance of the run: package versions, model revisions, config and prompt-set hashes.
# Its input is every other final target (an input function, evaluated once all rule files are included),
# so provenance is written last and reflects the finished run.
from llmgeom.pipeline.provenance import config_sha256

TARGETS += ["results/provenance.json", "results/provenance.md"]


rule provenance:
    """Package versions, model revisions (requested and resolved), config sha256, prompt-set sha256s."""
    input:
        lambda w: [t for t in TARGETS if not t.startswith("results/provenance")],
        models=expand("resources/models/{model}", model=MODELS),
        code=code("provenance"),
    output:
        json=report("results/provenance.json", caption="../report/provenance.rst", category="Provenance"),
        md=report("results/provenance.md", caption="../report/provenance.rst", category="Provenance"),
    params:
        config_sha256=config_sha256(config),
        models=MODELS,
        prompt_sets=PROMPT_SETS,
    resources:
        mem_mb=scaled_mem(1000),
        runtime=5,
    group:
        "summary"
    log:
        "logs/provenance.log",
    benchmark:
        "results/benchmarks/provenance.tsv",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/provenance.py"
