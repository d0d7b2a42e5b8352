from llmgeom.pipeline.jobs import run_logged

with run_logged(snakemake.log[0]):
    from llmgeom.analyses.sula import sula_tables
    from llmgeom.core.io import write_table
    from llmgeom.pipeline.schema import call_with_config

    p = snakemake.params
    t = call_with_config(sula_tables, p.cfg, dict(zip(p.conditions, snakemake.input.h5)),
                         model=snakemake.wildcards.model)
    o = snakemake.output
    for key, path in (("sula", o.sula), ("calibration", o.calibration), ("geometry", o.geometry),
                      ("prompts", o.prompts)):
        write_table(t[key], path)
    s = t["sula"]
    print(s[s.k == "all"][["condition", "labels", "n", "mae_bits", "pearson_r", "mean_h_model_bits",
                           "mean_h_bayes_bits", "mean_label_mass"]].to_string(index=False))
