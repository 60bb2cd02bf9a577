"""The preprocess service: public InferenceService in front of the generation service."""
