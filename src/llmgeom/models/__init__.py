"""Stage 1, models: sources and preparation (sources), loading (loading), the architectures table that
holds ALL family-specific knowledge (architectures), tiny random models for tests (tiny).

May import: torch and transformers (lazily, inside functions, except architectures type hints),
llmgeom.core. Never extract, analyses or anything above.
"""
