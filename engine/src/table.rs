//! The tables the engine prints for people, in one look: Markdown pipes, so that a result pastes
//! straight into `BENCHMARKS.md`, with numbers right-aligned. comfy-table lays them out.

use comfy_table::{CellAlignment, Table, presets};

/// An empty table under `header`, the columns whose indices are in `right` right-aligned.
pub fn table(header: &[&str], right: &[usize]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::ASCII_MARKDOWN).set_header(header.to_vec());
    for &i in right {
        if let Some(column) = t.column_mut(i) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::table;

    #[test]
    fn columns_line_up_and_numbers_align_right() {
        let mut t = table(&["phase", "tokens"], &[1]);
        t.add_row(vec!["prefill".to_string(), "3".into()]).add_row(vec!["decode".to_string(), "120".into()]);
        let text = t.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines.iter().all(|l| l.len() == lines[0].len()), "{text}");
        assert!(lines[2].contains("|      3 |") && lines[3].contains("|    120 |"), "{text}");
    }
}
