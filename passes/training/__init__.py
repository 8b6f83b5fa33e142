"""Training-graph generation (no DSL, no backends).

``artifacts.build`` turns a model into the train_step/gradients/eval/inference graphs, splicing
in a loss graph it is given, using ``optimizers`` (SGD/Adam/AdamW update nodes), ``modes``
(Dropout/BatchNorm training vs inference), ``imports`` (making imported models trainable) and
``graphc.passes.autodiff`` for the backward pass. ``graphc.compile.training`` is the public front.
"""
