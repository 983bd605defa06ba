"""The GEARS network and its parts: tensors in, tensors out, no files, ranks or devices of
its own.

- ``network``: ``GEARSModel``, computed once per distinct perturbation set;
- ``set_decoder``, ``weighted_norm``, ``graph_conv``, ``linear``: its fused per-gene
  decoder, the BatchNorm weighted by cells per set, the graph convolution
  (torch_geometric's SGConv) and a Linear with its backward pass written out;
- ``losses``: the GEARS loss (autofocus and direction terms, uncertainty);
- ``model_folder``: saved models in the published format (``model.pt``, ``config.pkl``).

May import: ``data``.
"""
