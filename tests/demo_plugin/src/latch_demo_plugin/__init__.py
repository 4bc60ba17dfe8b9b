"""latch-demo-plugin: a third-party package that adds the op ``demo::swish`` to Latch."""
