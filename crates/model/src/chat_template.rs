//! (Being written: see its work item.)
