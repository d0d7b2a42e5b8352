# llmgeom: geometry of LLM internal representations (Paper III + LSM). See README.md.
from snakemake.utils import min_version

min_version("9.0")


# Config files' text first: YAML errors with line and column, a key given twice with both lines (Snakemake's
# own load reports neither; for --configfile it has already loaded them, for config/config.yaml not yet).
from llmgeom.pipeline.checks import check_config_files

check_config_files(workflow.overwrite_configfiles or ["config/config.yaml"])


# The embedded default; `--configfile config/paper3.yaml` replaces it (it is not merged with it).
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"  # validates, fills the defaults and checks the config (once)
include: "workflow/rules/models.smk"
include: "workflow/rules/prompts.smk"
include: "workflow/rules/extract.smk"
include: "workflow/rules/value_manifold.smk"
include: "workflow/rules/domain_restriction.smk"
include: "workflow/rules/key_orthogonality.smk"
include: "workflow/rules/attention_focusing.smk"
include: "workflow/rules/intrinsic_dimension.smk"
include: "workflow/rules/curvature.smk"
include: "workflow/rules/margins.smk"
include: "workflow/rules/fisher.smk"
include: "workflow/rules/rate_distortion.smk"
include: "workflow/rules/decoding.smk"
include: "workflow/rules/sula.smk"
include: "workflow/rules/interventions.smk"
include: "workflow/rules/wind_tunnel.smk"
include: "workflow/rules/summary.smk"  # after every file that registers tables with summarize(...)
include: "workflow/rules/provenance.smk"
include: "workflow/rules/sweeps.smk"


# The GPU rules' group and priority, from their one declaration (llmgeom.pipeline.cluster.GPU); refuses a rule
# that asks for a GPU without being declared there.
declare_gpu_rules(workflow, is_corpus=get_is_corpus)

rule all:
    input:
        all_targets(),
    default_target: True
