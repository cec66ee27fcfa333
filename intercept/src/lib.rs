//! intercept library
