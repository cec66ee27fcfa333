//! copier library
