//! The `tandem` command-line tool.

fn main() {
    println!("tandem");
}
