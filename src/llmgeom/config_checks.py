"""Config checks that run while Snakemake builds the DAG (imported by workflow/rules/*.smk).

Pure Python on the config dict: this module imports nothing heavy (no torch, numpy, pandas, scipy,
scikit-learn), so that a no-op ``snakemake -n`` stays fast (issue 7: <= 3 s on 20 models). The functions
are defined here and re-exported by their home modules (``llmgeom.lsm``, ``llmgeom.bayes_geometry``),
where their documentation and tests live. ``tests/test_cluster.py`` checks that every module a rule file
imports stays light.
"""

from __future__ import annotations

# --- LSM (llmgeom.lsm) ---


class LSMConfigError(ValueError):
    """An LSM config value that is schema-valid but cannot work; names the key and the fix."""


def check_lsm_config(config: dict) -> None:
    """Cross-key checks for the LSM sections of the config.

    Raises:
        LSMConfigError: ``margins.prompt_set`` / ``fisher.prompt_set`` not a corpus prompt set;
            ``curvature.id_estimator`` not among ``intrinsic_dimension.estimators``;
            ``margins.fit_eps_max`` outside [eps_min, eps_max].
    """
    sets = config["prompts"]["sets"]
    for sec in ("margins", "fisher"):
        ps = config[sec]["prompt_set"]
        if ps not in sets or sets[ps]["kind"] != "corpus":
            raise LSMConfigError(f"{sec}.prompt_set is {ps!r}; it must name a prompt set of kind corpus in "
                                 f"prompts.sets (defined: {', '.join(sorted(sets))})")
    est = config["curvature"]["id_estimator"]
    if est not in config["intrinsic_dimension"]["estimators"]:
        raise LSMConfigError(f"curvature.id_estimator is {est!r} but intrinsic_dimension.estimators is "
                             f"{config['intrinsic_dimension']['estimators']}; add it there or change it")
    mg = config["margins"]
    if not (mg["eps_min"] < mg["fit_eps_max"] <= mg["eps_max"]):
        raise LSMConfigError(f"margins.fit_eps_max={mg['fit_eps_max']} must lie in (eps_min={mg['eps_min']}, "
                             f"eps_max={mg['eps_max']}]")


# --- Bayesian geometry (llmgeom.bayes_geometry) ---


def prompt_set_label(spec: dict) -> str:
    """Human label of a prompt-set config entry: its topics (domain), "mixed (all topics)", "code"."""
    kind = spec.get("kind")
    if kind == "domain" or spec.get("topics"):
        return ", ".join(spec.get("topics") or [])
    if kind == "mixed":
        return "mixed (all topics)"
    return str(kind)


def resolve_domain_sets(config: dict) -> dict:
    """The domain-restriction sets of a validated config.

    Returns dict with ``mixed`` (set name), ``restricted`` (list of set names: ``restricted_sets``, or
    every set of kind domain or code when it is null, in config order), ``summary`` (the restricted set
    of Table 1/2: ``summary_set`` or the first restricted set of kind domain, else the first one) and
    ``labels`` (set -> :func:`prompt_set_label`).
    """
    dr = config["domain_restriction"]
    sets = config["prompts"]["sets"]
    restricted = dr.get("restricted_sets")
    if restricted is None:
        restricted = [s for s, v in sets.items() if v["kind"] in ("domain", "code")]
    restricted = [s for s in restricted if s != dr["mixed_set"]]
    summary = dr.get("summary_set")
    if summary is None:
        doms = [s for s in restricted if sets.get(s, {}).get("kind") == "domain"]
        summary = (doms or restricted or [None])[0]
    labels = {s: prompt_set_label(sets[s]) for s in [dr["mixed_set"], *restricted] if s in sets}
    return {"mixed": dr["mixed_set"], "restricted": list(restricted), "summary": summary, "labels": labels}


def check_bayes_config(config: dict) -> None:
    """Cross-key checks of the Bayesian-geometry sections that JSON schema cannot express.

    Raises:
        llmgeom.workflow_support.ConfigError: a named prompt set is missing from ``prompts.sets`` or is
            a corpus set; no restricted set; ``summary_set`` not among the restricted sets.
    """
    from .workflow_support import ConfigError

    sets = config["prompts"]["sets"]
    r = resolve_domain_sets(config)
    named = {"domain_restriction.mixed_set": [r["mixed"]],
             "domain_restriction.restricted_sets": r["restricted"],
             "attention_focusing.prompt_set": [config["attention_focusing"]["prompt_set"]]}
    for key, names in named.items():
        for s in names:
            if s not in sets:
                raise ConfigError(f"{key} names prompt set {s!r}, which is not in prompts.sets "
                                  f"({', '.join(sorted(sets))}); add it under prompts.sets or change {key}")
            if sets[s]["kind"] == "corpus":
                raise ConfigError(f"{key} names {s!r}, a corpus set (no last-token or attention data); "
                                  "use a set of kind mixed, domain or code")
    if not r["restricted"]:
        raise ConfigError("domain_restriction: no restricted prompt set (define a set of kind domain or code, "
                          "or list them in domain_restriction.restricted_sets)")
    if r["summary"] not in r["restricted"]:
        raise ConfigError(f"domain_restriction.summary_set is {r['summary']!r}; it must be one of the restricted "
                          f"sets {r['restricted']}")
