from llmgeom.workflow.jobs import run_logged, set_threads

with run_logged(snakemake.log[0], threads=snakemake.threads):
    set_threads(snakemake.threads)
    from llmgeom.interventions.runner import intervention_experiment, save_axes
    from llmgeom.core.io import write_table

    p = snakemake.params
    per_prompt, axes, arrays = intervention_experiment(
        snakemake.input.model,
        snakemake.input.prompts,
        snakemake.input.h5,
        model_name=snakemake.wildcards.model,
        layers=p.layers,
        multi_layers=p.multi_layers,
        edits=p.edits,
        shift_scale=p.shift_scale,
        positions=p.positions,
        n_per_k=p.n_per_k,
        batch_size=p.batch_size,
        seed=p.seed,
        dtype=p.dtype,
        device=p.device,
        device_map=p.device_map,
    )
    write_table(per_prompt, snakemake.output.per_prompt)
    write_table(axes, snakemake.output.axes)
    save_axes(arrays, snakemake.output.vectors)
    print(axes.to_string(index=False))
