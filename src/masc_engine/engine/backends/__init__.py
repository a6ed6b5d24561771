"""Inference backends (ONNX Runtime, TensorRT, OpenVINO) behind one runner interface and a registry."""
