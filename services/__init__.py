"""mstar services: preprocess and generation."""
