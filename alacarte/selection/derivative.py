class DerivativeSelector: pass
