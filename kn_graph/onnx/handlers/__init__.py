"""ONNX op handlers, one module per op family; importing this package registers them all."""

from kn_graph.onnx.handlers import (  # noqa: F401
    attention,  # ONNX Attention (opset 23+), lowered to the IR Attention op
    contrib_activation,  # com.microsoft FastGelu, BiasGelu, QuickGelu, BiasAdd, ...
    contrib_attention,  # com.microsoft Attention, MultiHeadAttention
    contrib_embed,  # com.microsoft EmbedLayerNormalization
    contrib_fused,  # com.microsoft FusedMatMul, FusedGemm, FusedConv (onnxruntime's saved fusions)
    contrib_gqa,  # com.microsoft GroupQueryAttention (onnxruntime-genai LLMs)
    contrib_norm,  # com.microsoft Skip*LayerNormalization, GroupNorm; SimplifiedLayerNormalization
    contrib_rotary,  # com.microsoft RotaryEmbedding
    control,  # If with a load-time condition
    conv,  # Conv, ConvTranspose, Col2Im, CausalConvWithState
    deform_conv,
    dynamic,  # NonZero, TopK, NonMaxSuppression, Unique: sizes known at run time
    einsum,
    elementwise,  # arithmetic, math, activations, comparisons, logic, casts, Where
    grid,  # GridSample, AffineGrid
    linear_attention,
    loss,  # NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss
    nn,  # MatMul, Gemm, Softmax family, LRN, normalisations of vectors
    norm,  # BatchNorm, InstanceNorm, GroupNorm, LayerNorm, RMSNorm
    pool,  # Max/Average/Lp/Global pooling
    quant,  # QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear
    quant_blocked,  # com.microsoft MatMulNBits, GatherBlockQuantized (block-quantized weights)
    quant_contrib,  # onnxruntime's QLinearAdd, QLinearSoftmax, QLinearConcat, … (com.microsoft)
    quant_gemm,  # MatMulInteger, ConvInteger, QLinearMatMul/Conv, QGemm, ...: IntMatMul/IntConv
    quant_rnn,  # com.microsoft DynamicQuantizeLSTM (dequantized weights)
    reduce,  # Reduce*, ArgMax/ArgMin, CumSum/CumProd
    resize,  # Resize, Upsample
    rnn,  # RNN, LSTM, GRU (unrolled)
    roi_align,
    rotary,  # RotaryEmbedding
    sequence,  # sequences of load-time length, optionals holding a tensor
    shape,  # Shape, Reshape, Concat, Split, Expand, Range, …
    signal,  # DFT, STFT, window functions
    tensor,  # Slice, Gather*, Scatter*, Pad, Trilu, OneHot, …
)
