"""`specdraft eval`: acceptance length of a trained draft against the real target, checked lossless."""
