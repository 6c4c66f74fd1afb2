"""Spark integration: tracked sources, stages and sinks, the run loop, FT ON/OFF."""
