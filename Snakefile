# llmgeom: geometry of LLM internal representations (Paper III + LSM). See README.md.
from snakemake.utils import min_version, validate

min_version("9.0")


# The embedded default; `--configfile config/paper3.yaml` replaces it (it is not merged with it).
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


validate(config, "workflow/schemas/config.schema.yaml", set_default=True)


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/prompts.smk"
include: "workflow/rules/extract.smk"
include: "workflow/rules/geometry.smk"
include: "workflow/rules/manifold.smk"
include: "workflow/rules/figures.smk"


rule all:
    input:
        all_targets(),
    default_target: True
