"""Rule wind_tunnel: entropy calibration against the exact posterior and value-manifold geometry per layer."""
from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0], threads=snakemake.threads):
    from llmgeom.analyses.wind_tunnel import best_geometry, wind_tunnel_tables
    from llmgeom.core.io import write_table
    from llmgeom.pipeline.schema import call_with_config

    p = snakemake.params
    t = call_with_config(wind_tunnel_tables, p.cfg, snakemake.input.h5, model=snakemake.wildcards.model, step=p.step)
    o = snakemake.output
    for key, path in (("summary", o.summary), ("calibration", o.calibration), ("geometry", o.geometry),
                      ("prompts", o.prompts)):
        write_table(t[key], path)
    s = t["summary"]
    print(s[s.t == "all"][["model", "task", "step", "n", "mae_bits", "pearson_r", "spearman_rho",
                           "mean_answer_mass"]].to_string(index=False))
    print(best_geometry(t["geometry"]).to_string(index=False))
