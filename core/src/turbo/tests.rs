//! Integration tests of the TurboAttention emulation.
