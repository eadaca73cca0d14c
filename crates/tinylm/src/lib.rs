//! Transformer LM engine (filled by the model-engine issue).
