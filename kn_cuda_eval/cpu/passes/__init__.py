"""The CPU backend's passes over a plan: attention split into GEMMs and softmaxes (`attention`),
copies written in place by their producers (`elide`), activations and residuals folded into oneDNN
steps (`fuse`) and channels-last chains of convolutions (`layouts`)."""
