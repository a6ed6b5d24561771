"""Scoring on an engine: preprocessing, the encoders, the heads and the pair metrics."""
