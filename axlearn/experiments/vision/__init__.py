"""Vision experiments (AXLearn's `axlearn.experiments.vision`): ResNet on ImageNet."""
