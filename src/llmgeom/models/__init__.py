"""Stage 1, models: sources and preparation (sources), loading (loading), the family table and config-time
policy that hold ALL family-specific knowledge, torch-free (families: what the DAG-time config check reads), where a
loaded model keeps its parts and the W_K / fused-QKV maths (architectures), random-init twins (random_init), tiny
random models for tests (tiny).

May import: torch and transformers (lazily, inside functions, except type hints),
llmgeom.core. Never extract, analyses or anything above.
"""
